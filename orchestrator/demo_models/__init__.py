"""The project's own small target/draft model pair, built offline."""

from .build import build_demo_models, build_key

__all__ = ["build_demo_models", "build_key"]
