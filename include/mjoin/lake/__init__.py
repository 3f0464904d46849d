"""The lake: where everything lives (``layout``), the landing contract's file rules (``contract``), and the plan
registry with its ACTIVE pointer (``registry``)."""
