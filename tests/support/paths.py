"""Where the tests' files are, for tests in any folder under tests/."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"
SUPPORT = TESTS / "support"
