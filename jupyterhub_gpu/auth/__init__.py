"""Authenticators that bring the user's groups from the identity provider to the hub."""
