"""The lake: its layout, the landing contract, the plan registry, the quarantine, and file I/O on any filesystem."""
