"""Providers: the models a conversation talks to, behind one small protocol.

Only the protocol types are imported eagerly; the built-in providers load on first use so that
``import datamachine`` does not pull in pydantic models it may never need (and never httpx).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agents_api._lazy import lazy_exports
from datamachine.providers.base import Provider, ProviderRequest, ProviderResponse

if TYPE_CHECKING:
    from datamachine.providers.chat_messages import ChatMessage, ChatToolCall, to_chat_messages
    from datamachine.providers.normalize import normalize_response
    from datamachine.providers.openai import OpenAIProvider
    from datamachine.providers.registry import ProviderRegistry, RegisteredProvider
    from datamachine.providers.scripted import (
        Script,
        ScriptCursor,
        ScriptedProvider,
        ScriptedResponse,
        ScriptedToolCall,
        load_script,
        scripted_provider_for,
    )
    from datamachine.providers.text_tool_calls import extract_text_tool_calls

_EXPORTS: dict[str, str] = {
    "ChatMessage": "datamachine.providers.chat_messages",
    "ChatToolCall": "datamachine.providers.chat_messages",
    "to_chat_messages": "datamachine.providers.chat_messages",
    "normalize_response": "datamachine.providers.normalize",
    "OpenAIProvider": "datamachine.providers.openai",
    "ProviderRegistry": "datamachine.providers.registry",
    "RegisteredProvider": "datamachine.providers.registry",
    "Script": "datamachine.providers.scripted",
    "ScriptCursor": "datamachine.providers.scripted",
    "ScriptedProvider": "datamachine.providers.scripted",
    "ScriptedResponse": "datamachine.providers.scripted",
    "ScriptedToolCall": "datamachine.providers.scripted",
    "load_script": "datamachine.providers.scripted",
    "scripted_provider_for": "datamachine.providers.scripted",
    "extract_text_tool_calls": "datamachine.providers.text_tool_calls",
}

__all__ = [
    "ChatMessage",
    "ChatToolCall",
    "OpenAIProvider",
    "Provider",
    "ProviderRegistry",
    "ProviderRequest",
    "ProviderResponse",
    "RegisteredProvider",
    "Script",
    "ScriptCursor",
    "ScriptedProvider",
    "ScriptedResponse",
    "ScriptedToolCall",
    "extract_text_tool_calls",
    "load_script",
    "normalize_response",
    "scripted_provider_for",
    "to_chat_messages",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)
