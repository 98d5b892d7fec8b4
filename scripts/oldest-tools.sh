# The test tools of the oldest-pins venv (scripts/test, scripts/refresh-constraints);
# their exact versions are in scripts/constraints/oldest.txt.
OLDEST_TOOLS=("pytest>=8" "pytest-asyncio>=0.24" "pytest-xdist>=3.8" "cryptography>=42" "hypothesis>=6")
