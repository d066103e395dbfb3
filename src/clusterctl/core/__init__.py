"""What every layer shares: errors (exit codes), paths (data, cache, state), console, deadlines,
YAML files with lines and limits (yamlfile), control characters in user text (text)."""
