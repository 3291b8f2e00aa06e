"""One report line per call, written to stdout in ONE write(2): the ranks' lines reach the
launcher through pipes or ptys, and a line written in pieces (print's text, then its newline)
can have another rank's line land in the middle of it."""

import os


def report(*parts):
    """Writes the parts joined by spaces, newlines flattened, as one line."""
    text = " ".join(str(p) for p in parts).replace("\r", " ").replace("\n", " ")
    os.write(1, (text + "\n").encode())
