"""A child process of an end-to-end test: its stderr in a log file under the test's directory,
killed and started again with the same arguments (the kill loops), stopped at the end."""
import os
import signal
import subprocess


class Proc:
    def __init__(self, name, argv, workdir):
        self.name, self.argv = name, argv
        self.log_path = os.path.join(workdir, name + ".log")
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=open(self.log_path, "ab"))

    def alive(self):
        return self.proc.poll() is None

    def kill(self):
        """SIGKILL, and waits for it."""
        if self.alive():
            self.proc.kill()
        self.proc.wait()

    def stop(self, timeout=20):
        """SIGTERM (SIGKILL after `timeout` s); the exit code."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")
