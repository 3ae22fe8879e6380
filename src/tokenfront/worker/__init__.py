"""The worker (`tokenfront serve`): an OpenAI-compatible server that runs a real model and accepts rendered ids."""
