"""``python -m mamba3.tasks ...`` = ``python -m mamba3 train ...``."""
import sys

from .train import main

sys.exit(main())
