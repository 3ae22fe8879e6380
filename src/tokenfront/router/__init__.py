"""The KV-cache-aware router (`tokenfront route`): renders each request, picks a worker, forwards ids when safe."""
