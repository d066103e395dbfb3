"""What every layer shares: errors (exit codes), paths (data, cache, state), console, deadlines."""
