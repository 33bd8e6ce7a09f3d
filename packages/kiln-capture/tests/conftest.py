"""Test setup for kiln-capture: shared test helpers import by their plain names."""

import pathlib
import sys

_HERE = pathlib.Path(__file__).parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))
