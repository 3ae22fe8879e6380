"""What every tokenfront server shares: the app factory, OpenAI-shaped errors, auth, limits and metrics."""
