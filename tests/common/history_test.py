"""The history checker catches each violation it claims to (tests/common/history.py)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import history  # noqa: E402


def op(key, status=200, execution="e1", body="b", replayed=False):
    return {"type": "op", "key": key, "attempt": 1, "sent": 0, "answered": 1, "status": status,
            "execution": execution, "replayed": replayed, "body": history.body_digest(body)}


def ex(key, execution, attempt=None, group=None, seq=None):
    r = {"type": "exec", "key": key, "execution": execution, "attempt": attempt}
    if group is not None:
        r.update(group=group, seq=seq)
    return r


class Checker(unittest.TestCase):
    def sentences(self, records, policy="unknown"):
        return [s for _, s in history.check(records, policy)]

    def test_a_clean_history_holds(self):
        records = [ex("k1", "e1"), op("k1"), op("k1", replayed=True), op("k1", status=409, execution=None, body=None),
                   op("k1", status=None, execution=None, body=None), ex("k2", "e2"), op("k2", execution="e2")]
        self.assertEqual(history.check(records), [])
        ok, text = history.report(records)
        self.assertTrue(ok, text)

    def test_two_executions_of_a_key(self):
        self.assertIn("executed 2 times", self.sentences([ex("k", "e1"), ex("k", "e2"), op("k")])[0])

    def test_reexecute_allows_a_takeover_only(self):
        takeover = [ex("k", "e1", "1"), ex("k", "e2", "2"), op("k", execution="e2")]
        self.assertEqual(history.check(takeover, "reexecute"), [])
        same_attempt = [ex("k", "e1", "1"), ex("k", "e2", "1"), op("k", execution="e2")]
        self.assertIn("takeover", self.sentences(same_attempt, "reexecute")[0])
        unnumbered = [ex("k", "e1"), ex("k", "e2"), op("k", execution="e2")]
        self.assertIn("takeover", self.sentences(unnumbered, "reexecute")[0])

    def test_an_answer_with_another_keys_response(self):
        records = [ex("a", "ea"), ex("b", "eb"), op("a", execution="ea"), op("b", execution="ea")]
        self.assertIn("response of key a", self.sentences(records)[0])

    def test_an_answer_with_an_execution_that_never_ran(self):
        self.assertIn("never ran", self.sentences([ex("k", "e1"), op("k", execution="e9")])[0])

    def test_a_replay_that_differs(self):
        records = [ex("k", "e1"), op("k", body="one"), op("k", body="two", replayed=True)]
        self.assertIn("different bodies", self.sentences(records)[0])

    def test_an_acknowledged_operation_lost(self):
        self.assertIn("lost", self.sentences([op("k", execution=None)])[0])

    def test_a_parked_key_is_accounted_for(self):
        self.assertEqual(history.check([op("k", execution=None), {"type": "parked", "key": "k"}]), [])

    def test_groups_in_order_hold_even_interleaved_and_with_a_second_execution(self):
        records = [ex("a/1", "e1", "1", "a", 1), ex("b/1", "e2", None, "b", 1), ex("a/2", "e3", "1", "a", 2),
                   ex("a/1", "e4", "2", "a", 1), ex("b/2", "e5", None, "b", 2)]
        self.assertEqual(history.check(records, "reexecute"), [])

    def test_a_group_out_of_order(self):
        records = [ex("a/1", "e1", None, "a", 1), ex("a/3", "e2", None, "a", 3), ex("a/2", "e3", None, "a", 2)]
        sentences = self.sentences(records)
        self.assertEqual(len(sentences), 1)
        self.assertIn("out of order: event 3 of the group ran as its #2", sentences[0])

    def test_a_group_with_a_gap_or_a_late_first(self):
        self.assertIn("out of order", self.sentences([ex("a/2", "e1", None, "a", 2)])[0])
        self.assertIn("out of order", self.sentences([ex("a/1", "e1", None, "a", 1), ex("a/1b", "e2", None, "a", 1)])[0])

    def test_the_report_names_the_key_with_its_excerpt(self):
        ok, text = history.report([ex("k", "e1"), ex("k", "e2"), op("k")])
        self.assertFalse(ok)
        self.assertIn("key k: executed 2 times", text)
        self.assertIn('"execution": "e2"', text)


if __name__ == "__main__":
    unittest.main(verbosity=2)
