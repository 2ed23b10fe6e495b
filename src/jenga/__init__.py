"""jenga."""
