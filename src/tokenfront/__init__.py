"""tokenfront: render OpenAI requests into the exact prompt token ids a worker computes, once."""

from tokenfront.core.errors import RenderError
from tokenfront.core.render import RenderedPrompt, RenderPipeline
from tokenfront.options import RenderOptions

__version__ = "0.1.0"

__all__ = ["RenderError", "RenderOptions", "RenderPipeline", "RenderedPrompt", "__version__"]
