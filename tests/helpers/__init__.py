"""Shared test helpers: modules the tests import (``from helpers.x import ...``) and worker scripts
they run as subprocesses by path. The fixtures stay in tests/conftest.py."""
