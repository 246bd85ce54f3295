from __future__ import annotations

from draftnas.cli import main

main()
