"""The render routes and the standalone renderer (`tokenfront render`)."""
