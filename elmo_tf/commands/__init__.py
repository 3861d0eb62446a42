"""The command lines: each parses flags, calls the library, and turns errors into messages and exit codes."""
