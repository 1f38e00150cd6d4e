"""`python -m dapple_launch [overrides]`: compose → check → plan → launch (dapple_launch/cli.py)."""

from .cli import main

if __name__ == "__main__":
    main()
