"""The heartbeat child of a command whose progress goes to a log (`cli.progress.ChildProgress`)."""

from __future__ import annotations

import sys

from draftnas.cli.progress import LOG_INTERVAL_S, child_main

if __name__ == "__main__":
    child_main(float(sys.argv[1]) if len(sys.argv) > 1 else LOG_INTERVAL_S)
