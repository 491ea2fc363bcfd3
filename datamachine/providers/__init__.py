"""Providers: the models a conversation talks to, behind one small protocol."""

from datamachine.providers.base import Provider, ProviderRequest, ProviderResponse

__all__ = ["Provider", "ProviderRequest", "ProviderResponse"]
