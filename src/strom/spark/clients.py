"""librdkafka clients made from the connector's options, in one place so that every one of them
reports two things the same way:

- a setting librdkafka refuses is named as the user wrote it (`kafka.max.request.size`), not by
  librdkafka's name for it (`message.max.bytes`);
- a broker that refuses the connection for a reason that waiting will not change (wrong
  password, TLS handshake) fails the call at once with the broker's own words, where librdkafka
  alone would only time out ("Broker transport failure") and print the reason to stderr.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException

from strom.spark.options import ClientOptions, StromOptionError

T = TypeVar("T")

# Errors that will not go away by waiting: the brokers refuse who we are or how we connect.
LASTING = {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._SSL,
           KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.UNSUPPORTED_SASL_MECHANISM,
           KafkaError.ILLEGAL_SASL_STATE}
FIRST_SLICE_S = 0.25  # a blocking call's first wait; each try after it waits twice as long


class StromBrokerError(RuntimeError):
    """The brokers refused the client (or it failed for good); the message carries the reason."""


class BrokerErrors:
    """A client's error_cb: keeps the first error that waiting will not cure."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.first: KafkaError | None = None

    def __call__(self, error: KafkaError) -> None:
        if self.first is None and (error.fatal() or error.code() in LASTING):
            self.first = error

    def check(self) -> None:
        if self.first is not None:
            raise StromBrokerError(f"Kafka brokers {self.bootstrap} (kafka.bootstrap.servers): "
                                   f"{self.first.str()}")


def in_user_terms(message: str, client: ClientOptions) -> str:
    """librdkafka's message with its setting names replaced by the options they came from."""
    for name, option in client.origin.items():
        if name != option:
            message = message.replace(f'"{name}"', f'"{option}"')
    return message


def make(kind: Callable[[dict[str, Any]], T], client: ClientOptions, role: str,
         errors: BrokerErrors | None = None, *, forced: dict[str, Any] | None = None, **defaults: Any) -> T:
    """A librdkafka client (Producer, Consumer, AdminClient) of `role` ("producer", "consumer",
    "admin"): the connector's `defaults`, then the user's settings, then what the connector
    cannot do without (`forced`); `errors` is its error_cb."""
    conf = {**client.client_conf(role, **defaults), **(forced or {})}
    if errors is not None:
        conf["error_cb"] = errors
    try:
        return kind(conf)
    except KafkaException as e:
        raise StromOptionError(f"Kafka client settings refused: {in_user_terms(e.args[0].str(), client)}") from None


def wait(attempt: Callable[[float], T], errors: BrokerErrors, timeout_s: float, poll: Callable[[float], Any],
         retry: Callable[[KafkaException], bool]) -> T:
    """`attempt(seconds)` again within `timeout_s` while it fails with an error `retry`
    accepts, serving callbacks (`poll`) in between so that a refusal by the brokers ends the
    wait early. Each try waits twice as long as the one before (a request that a busy broker
    answers slowly is not cut short forever). The last error when time is up."""
    deadline = time.monotonic() + timeout_s
    slice_s = FIRST_SLICE_S
    while True:
        left = deadline - time.monotonic()
        try:
            return attempt(max(0.01, min(slice_s, left)))
        except KafkaException as e:
            poll(0)
            errors.check()
            if not retry(e) or time.monotonic() >= deadline:
                raise
        slice_s *= 2
