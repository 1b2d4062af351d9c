#!/usr/bin/env python3
"""mpsshim benchmark harness; the code is the package bench/harness/ (its __init__.py says what
it measures and how to run it): `python3 bench/harness.py --help`."""
import os
import sys

# This directory first: `harness` is the package beside this file.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
