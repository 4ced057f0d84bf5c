"""CreateDelegationToken, RenewDelegationToken, ExpireDelegationToken and
DescribeDelegationToken (KIP-48; security/delegation_tokens.py keeps the tokens).

As in Kafka, tokens are handed out only to clients that proved who they are with something
other than a token: not over PLAINTEXT, not anonymously over SSL, not when authenticated with
a token (DELEGATION_TOKEN_REQUEST_NOT_ALLOWED).

On a KRaft broker (tokens.forwarded) Create, Renew and Expire pass the broker's checks here and
are then answered by the active controller (the broker forwards them as the client's).

From v1 only, as Kafka 4.0 (KIP-896 removed v0): a v0 request is an unsupported version, and
the connection is closed.
"""

from __future__ import annotations

from strom.metadata.delegation_token import TokenError, TokenInformation
from strom.protocol.errors import ErrorCode, KafkaError
from strom.security.authorizer import (
    CREATE_TOKENS,
    DELEGATION_TOKEN,
    DESCRIBE,
    DESCRIBE_TOKENS,
    USER,
    allowed,
)
from strom.security.tls import ANONYMOUS
from strom.server.apis import RequestContext, api

CREATE, RENEW, EXPIRE, DESCRIBE_TOKEN = 38, 39, 40, 41


def token_requests_allowed(ctx: RequestContext, forwarded: bool = False) -> bool:
    """Never with a token; not over PLAINTEXT nor one-way SSL, unless the request was forwarded
    by a broker (which checked the client's own listener), as Kafka's controller allows."""
    if ctx.token_authenticated:
        return False
    if forwarded:
        return True
    return ctx.security_protocol != "PLAINTEXT" and not (ctx.security_protocol == "SSL" and ctx.principal == ANONYMOUS)



def create_answer(ctx: RequestContext, request) -> tuple[str, dict]:
    """CreateDelegationToken's owner (the requester unless the request names one, v3) and the
    answer without a token, which each error takes."""
    owner = ctx.principal
    if getattr(request, "owner_principal_name", None):
        owner = f"{request.owner_principal_type or 'User'}:{request.owner_principal_name}"
    kind, name = _split(owner)
    requester_kind, requester_name = _split(ctx.principal)
    return owner, {"error_code": ErrorCode.NONE, "principal_type": kind, "principal_name": name,
                   "token_requester_principal_type": requester_kind, "token_requester_principal_name": requester_name,
                   "issue_timestamp_ms": -1, "expiry_timestamp_ms": -1, "max_timestamp_ms": -1, "token_id": "",
                   "hmac": b"", "throttle_time_ms": 0}


def _split(principal: str) -> tuple[str, str]:
    kind, _, name = principal.partition(":")
    return kind, name


@api(CREATE, 1, 3)
async def handle_create_delegation_token(broker, ctx: RequestContext, request) -> dict:
    owner, answer = create_answer(ctx, request)
    if not token_requests_allowed(ctx):
        return {**answer, "error_code": ErrorCode.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED}
    renewers = [f"{r.principal_type}:{r.principal_name}" for r in request.renewers]
    if any(not r.startswith("User:") for r in renewers) or not owner.startswith("User:"):
        return {**answer, "error_code": ErrorCode.INVALID_PRINCIPAL_TYPE}
    if owner != ctx.principal and not allowed(broker, ctx, CREATE_TOKENS, USER, owner):
        return {**answer, "error_code": ErrorCode.DELEGATION_TOKEN_AUTHORIZATION_FAILED}
    tokens = broker.delegation_tokens
    if tokens.forwarded:
        return await _forward(broker, ctx, request, answer)
    try:
        info, token_hmac = await broker.store_io(tokens.create, owner, ctx.principal, renewers, request.max_lifetime_ms)
    except TokenError as e:
        return {**answer, "error_code": e.code}
    return {**answer, "issue_timestamp_ms": info.issue_ms, "expiry_timestamp_ms": info.expiry_ms,
            "max_timestamp_ms": info.max_ms, "token_id": info.token_id, "hmac": token_hmac}


async def _forward(broker, ctx: RequestContext, request, answer: dict) -> dict:
    """The active controller's answer (KRaft); `answer` with the error when there is none."""
    try:
        return await broker.forward(ctx, request)
    except KafkaError as e:
        return {**answer, "error_code": e.code}


async def _change(broker, ctx: RequestContext, request, change: str, token_hmac: bytes, period_ms: int) -> dict:
    failed = {"error_code": ErrorCode.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED, "expiry_timestamp_ms": -1,
              "throttle_time_ms": 0}
    if not token_requests_allowed(ctx):
        return failed
    if broker.delegation_tokens.forwarded:
        return await _forward(broker, ctx, request, failed)
    try:
        expiry = await broker.store_io(getattr(broker.delegation_tokens, change), ctx.principal, bytes(token_hmac),
                                       period_ms)
    except TokenError as e:
        return {"error_code": e.code, "expiry_timestamp_ms": -1, "throttle_time_ms": 0}
    return {"error_code": ErrorCode.NONE, "expiry_timestamp_ms": expiry, "throttle_time_ms": 0}


@api(RENEW, 1, 2)
async def handle_renew_delegation_token(broker, ctx: RequestContext, request) -> dict:
    return await _change(broker, ctx, request, "renew", request.hmac, request.renew_period_ms)


@api(EXPIRE, 1, 2)
async def handle_expire_delegation_token(broker, ctx: RequestContext, request) -> dict:
    return await _change(broker, ctx, request, "expire", request.hmac, request.expiry_time_period_ms)


@api(DESCRIBE_TOKEN, 1, 3)
async def handle_describe_delegation_token(broker, ctx: RequestContext, request) -> dict:
    tokens = broker.delegation_tokens
    if not token_requests_allowed(ctx):
        return {"error_code": ErrorCode.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED, "tokens": [], "throttle_time_ms": 0}
    if not tokens.enabled:
        return {"error_code": ErrorCode.DELEGATION_TOKEN_AUTH_DISABLED, "tokens": [], "throttle_time_ms": 0}
    owners = None if request.owners is None else [f"{o.principal_type}:{o.principal_name}" for o in request.owners]
    described = []
    for cached in tokens.tokens.values():
        info = cached.info
        if owners is not None and not any(info.owner_or_renewer(o) for o in owners):
            continue
        if not _may_describe(broker, ctx, info):
            continue
        kind, name = _split(info.owner)
        requester_kind, requester_name = _split(info.requester)
        described.append({
            "principal_type": kind, "principal_name": name, "token_requester_principal_type": requester_kind,
            "token_requester_principal_name": requester_name, "issue_timestamp": info.issue_ms,
            "expiry_timestamp": info.expiry_ms, "max_timestamp": info.max_ms, "token_id": info.token_id,
            "hmac": cached.hmac,
            "renewers": [dict(zip(("principal_type", "principal_name"), _split(r), strict=True)) for r in info.renewers]})
    return {"error_code": ErrorCode.NONE, "tokens": described, "throttle_time_ms": 0}


def _may_describe(broker, ctx: RequestContext, info: TokenInformation) -> bool:
    """Owners and renewers see their tokens; others only where an authorizer lets them
    (DESCRIBE on the token), so with no authorizer everyone sees every token, as in Kafka."""
    return (info.owner_or_renewer(ctx.principal) or allowed(broker, ctx, DESCRIBE, DELEGATION_TOKEN, info.token_id)
            or allowed(broker, ctx, DESCRIBE_TOKENS, USER, info.owner))
