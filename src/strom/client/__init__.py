"""The wire client: connections that speak Kafka's protocol through `strom.protocol`, for the
tools, the tests, the Spark connector and the brokers' connections to each other."""

from strom.client.connection import AsyncConnection, Connection, ConnectionCache
from strom.client.security import AuthenticationError, ClientSecurity

__all__ = ["AsyncConnection", "AuthenticationError", "ClientSecurity", "Connection", "ConnectionCache"]
