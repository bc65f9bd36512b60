"""A scratch directory for one end-to-end test's databases and logs (Python 3 stdlib only)."""
import shutil
import tempfile


def run_in_scratch_dir(prefix, body):
    """Runs body(path) with a fresh temporary directory: removed when body returns, kept and named
    when it fails, so that a failed run's databases and logs can still be read."""
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        body(path)
    except BaseException:
        print("kept %s (databases and logs of the failed run)" % path, flush=True)
        raise
    shutil.rmtree(path, ignore_errors=True)
