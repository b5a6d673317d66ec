"""What the tests share: builders, clients and processes. Test modules import from here,
never from one another or from conftest.py (tests/test_test_layout.py checks it)."""
