"""Make the corpus harness importable by its plain name from the test and program files."""

import pathlib
import sys

_HERE = str(pathlib.Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
