"""Starting and driving the `_replay_procs.py` processes of the load and fault tests."""
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "replay_tf", "_replay_procs.py")


class Proc:
    """A `_replay_procs.py ROLE CONFIG` process; its stdout lines are collected by a thread."""

    def __init__(self, role: str, config: dict, log_dir: str, name: str):
        env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
        self.name = name
        self.log_path = os.path.join(log_dir, f"{name}.stderr")
        self._log = open(self.log_path, "wb")
        self.popen = subprocess.Popen([sys.executable, SCRIPT, role, json.dumps(config)], env=env, cwd=ROOT,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                      text=True, bufsize=1)
        self.pid = self.popen.pid
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.popen.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def stderr_tail(self, n: int = 3000) -> str:
        self._log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")[-n:]

    def expect(self, prefix: str, timeout_s: float) -> str:
        """The rest of the first stdout line starting with `prefix` (AssertionError after `timeout_s` or on exit)."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{self.name}: no {prefix!r} line within {timeout_s}s\n{self.stderr_tail()}"
            try:
                line = self._lines.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                continue
            assert line is not None, (f"{self.name} exited ({self.popen.poll()}) before printing {prefix!r}\n"
                                      f"{self.stderr_tail()}")
            if line.startswith(prefix):
                return line[len(prefix):].strip()

    def report(self, timeout_s: float) -> dict:
        return json.loads(self.expect("REPORT", timeout_s))

    def send(self, line: str) -> None:
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()

    def wait(self, timeout_s: float) -> int:
        return self.popen.wait(timeout_s)

    def close(self) -> None:
        self.kill()
        for stream in (self.popen.stdin, self.popen.stdout):
            try:
                stream.close()
            except Exception:  # noqa: BLE001
                pass
        self._log.close()


def _popen_serve(*args) -> subprocess.Popen:
    """`python -m replay_tf.cli serve ARGS` from this checkout, stdout and stderr together in its text `stdout`."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    return subprocess.Popen([sys.executable, "-m", "replay_tf.cli", "serve", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def start_serve(*args) -> tuple:
    """`replay-tf serve ARGS` in a process of its own (stdout and stderr in its text `stdout`); returns
    `(process, port)` once it serves."""
    proc = _popen_serve(*args)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("replay-tf: serving tables"):
            return proc, int(line.split(" on ")[1].split()[0].rsplit(":", 1)[1])
    proc.wait(10)
    raise AssertionError(f"replay-tf serve exited ({proc.returncode}) before serving:\n{''.join(seen)}")


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def remote_client(address: str):
    """A `replay_tf.Client` that talks gRPC even if a server of this process owns `address`."""
    import replay_tf as reverb
    from replay_tf.grpc.client import client_transport
    client = reverb.Client(address)
    client._transport = client_transport.Transport(address)
    return client


def free_port() -> int:
    """A port free on localhost now (for a server process given `--port`)."""
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


class ServeProcess:
    """`python -m replay_tf.cli serve ...` with its stdout read line by line on a thread."""

    def __init__(self, *args):
        self.proc = _popen_serve(*args)
        self.lines = queue.Queue()
        self.seen = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, pattern, timeout_s=90):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            self.seen.append(line)
            match = re.search(pattern, line)
            if match:
                return match
        raise AssertionError(f"no line matching {pattern!r} within {timeout_s}s; output so far:\n"
                             + "\n".join(self.seen))

    def stop(self, sig=signal.SIGINT, timeout_s=60):
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.reader.join(10)
        self.proc.stdout.close()


def without_hanging(fn, fifo, timeout_s=60.0):
    """Runs fn() in a thread; if it is still running after `timeout_s` it is blocked in open() of `fifo`: opening
    the FIFO's other end releases it (so the suite goes on) and the test fails."""
    result = {}

    def target():
        try:
            result["value"] = fn()
        except BaseException as e:  # noqa: BLE001  (re-raised in the test's thread)
            result["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    hung = thread.is_alive()
    deadline = time.monotonic() + 60
    while thread.is_alive() and time.monotonic() < deadline:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # releases a reader blocked in open()
        except OSError:
            pass
        thread.join(0.1)
    assert not hung, f"{fn} blocked on the FIFO {fifo} for {timeout_s} s"
    if "error" in result:
        raise result["error"]
    return result["value"]
