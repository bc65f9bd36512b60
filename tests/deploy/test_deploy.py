#!/usr/bin/env python3
"""The dashboard and the alerting rules in deploy/ name only metrics that exist: every idem_*
metric in deploy/grafana/idem-dashboard.json and deploy/prometheus/idem-alerts.yml must appear in
the /metrics of a running idem-gateway, idem-consume or idem-relay (a histogram's _bucket, _sum
and _count included), and every expression's labels must be ones that metric has.

    test_deploy.py --gateway BIN --upstream-bin BIN --consume BIN --relay BIN --seed BIN

Needs IDEM_TEST_REDIS_URL (scripts/test starts the server): idem-consume reads a Redis stream.
"""
import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gateway"))
import brokers  # noqa: E402
from scratch import run_in_scratch_dir  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "idem-dashboard.json")
ALERTS = os.path.join(ROOT, "deploy", "prometheus", "idem-alerts.yml")

# A selector: `name{label="v", label=~"a|b"}` or a bare name.
SELECTOR = re.compile(r"\b(idem_[a-z_]+)(\{([^}]*)\})?")
# Labels a PromQL expression groups by: `by (a, b)`.
BY = re.compile(r"\bby \(([^)]*)\)")


def expressions():
    with open(DASHBOARD) as f:
        dashboard = json.load(f)
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            yield "dashboard panel %r" % panel["title"], target["expr"]
    with open(ALERTS) as f:
        text = f.read()
    # The rules file is plain YAML the test reads without a YAML library: each `expr:` is one
    # line, or a folded block (`expr: >`) of the more indented lines after it.
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(- alert: (\S+)|expr: (.*))$", lines[i])
        if m and m.group(4) is not None:
            expr = m.group(4).strip()
            if expr in (">", "|"):
                indent = len(m.group(1))
                block = []
                i += 1
                while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                    block.append(lines[i].strip())
                    i += 1
                expr = " ".join(block)
                yield "alert before line %d" % i, expr
                continue
            yield "alert at line %d" % (i + 1), expr
        i += 1


def exposed(text):
    """{sample name: set of label names} of a /metrics text."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s", line)
        if not m:
            continue
        labels = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', m.group(3) or ""))
        out.setdefault(m.group(1), set()).update(labels)
    return out


def main():
    parser = argparse.ArgumentParser()
    for flag in ("--gateway", "--upstream-bin", "--consume", "--relay", "--seed"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args()
    for name in ("gateway", "upstream_bin", "consume", "relay", "seed"):
        setattr(args, name, os.path.abspath(getattr(args, name)))
    run_in_scratch_dir("idem-deploy-", lambda tmp: check(args, tmp))


def start(name, argv, tmp):
    import subprocess
    log = open(os.path.join(tmp, name + ".log"), "wb")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)


def metrics_of(port, proc, name):
    def up():
        if proc.poll() is not None:
            raise AssertionError("%s exited with %s" % (name, proc.returncode))
        try:
            return brokers.http_get(port, "/metrics")[0] == 200
        except OSError:
            return False
    brokers.wait_until(up, 30, what="%s /metrics" % name)
    return exposed(brokers.http_get(port, "/metrics")[1])


def check(args, tmp):
    import subprocess
    redis = brokers.env("IDEM_TEST_REDIS_URL")
    ports = {n: brokers.free_port() for n in ("upstream", "gateway", "gateway_admin", "consume", "relay")}
    outbox = os.path.join(tmp, "outbox.db")
    subprocess.run([args.seed, "create", "sqlite:" + outbox], check=True, stdout=subprocess.DEVNULL, timeout=60)
    procs = {}
    try:
        procs["upstream"] = start("upstream", [args.upstream_bin, "--listen", "127.0.0.1:%d" % ports["upstream"]], tmp)
        procs["gateway"] = start("gateway", [
            args.gateway, "--listen", "127.0.0.1:%d" % ports["gateway"], "--admin-listen",
            "127.0.0.1:%d" % ports["gateway_admin"], "--upstream", "http://127.0.0.1:%d" % ports["upstream"],
            "--store", "memory:"], tmp)
        stream = "redis+stream://%s/deploy-%s?group=consumers" % (redis.split("://", 1)[1].rstrip("/"), os.getpid())
        procs["consume"] = start("consume", [
            args.consume, "--source", stream, "--deliver", "http://127.0.0.1:%d/echo" % ports["upstream"],
            "--store", "sqlite:" + os.path.join(tmp, "consume.db"), "--admin-listen", "127.0.0.1:%d" % ports["consume"]],
            tmp)
        procs["relay"] = start("relay", [
            args.relay, "--outbox", "sqlite:" + outbox, "--sink", "http://127.0.0.1:%d/echo" % ports["upstream"],
            "--admin-listen", "127.0.0.1:%d" % ports["relay"]], tmp)
        available = {}
        for name, port in (("gateway", ports["gateway_admin"]), ("consume", ports["consume"]), ("relay", ports["relay"])):
            for metric, labels in metrics_of(port, procs[name], name).items():
                available.setdefault(metric, set()).update(labels)
        problems = []
        checked = 0
        for where, expr in expressions():
            grouped = set()
            for g in BY.findall(expr):
                grouped.update(x.strip() for x in g.split(",") if x.strip())
            for m in SELECTOR.finditer(expr):
                name = m.group(1)
                checked += 1
                if name not in available:
                    problems.append("%s: %s is not exposed by any binary" % (where, name))
                    continue
                used = set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!=|!~|=)", m.group(3) or ""))
                # `le` comes with _bucket; `instance` is Prometheus's own target label.
                known = available[name] | {"instance", "job"}
                for label in used - known:
                    problems.append("%s: %s has no label %r" % (where, name, label))
            metrics_here = {m.group(1) for m in SELECTOR.finditer(expr)}
            for label in grouped - {"instance", "job"}:
                if not any(label in available.get(n, set()) for n in metrics_here):
                    problems.append("%s: grouped by %r, which none of %s has" % (where, label, sorted(metrics_here)))
        if problems:
            raise AssertionError("\n".join(problems))
        if checked < 30:
            raise AssertionError("only %d metric references found: is the parser reading the files?" % checked)
        print("deploy: %d metric references in the dashboard and the alerts, all exposed" % checked)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()


if __name__ == "__main__":
    main()
