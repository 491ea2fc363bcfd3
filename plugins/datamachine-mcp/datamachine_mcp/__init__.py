"""datamachine-mcp (work in progress)."""
