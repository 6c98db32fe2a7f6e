"""attacks package."""
