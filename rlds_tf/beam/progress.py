"""The progress lines the workers print as shards finish."""
import sys


def report(line: str) -> None:
    """Prints `line` to stderr in one write: Beam's workers may run with unbuffered streams, where `print`
    writes the text and its newline apart, and lines of processes sharing the launcher's stderr interleave."""
    sys.stderr.write(f"{line}\n")
    sys.stderr.flush()
