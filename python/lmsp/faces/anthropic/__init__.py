"""Anthropic's Messages API (`/v1/messages`), for the anthropic SDKs and Claude Code."""

from .routes import AnthropicFace

__all__ = ["AnthropicFace"]
