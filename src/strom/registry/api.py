"""Confluent Schema Registry's REST API over aiohttp, on the broker's event loop.

Bodies are JSON (application/vnd.schemaregistry.v1+json, application/json or none named);
answers carry application/vnd.schemaregistry.v1+json; errors are {"error_code", "message"}.
A request body over `max_body` gets 413, more open connections than `max_connections` are
closed as they arrive. A write that reaches a broker other than the writer is forwarded to the
writer's registry over HTTP (the writer's `schema.registry.listeners`, asked of the writer
broker with DescribeConfigs over the inter-broker connection).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, web

from strom.registry import errors as err
from strom.registry.errors import RegistryError
from strom.registry.service import NotWriter, SchemaRegistry, parse_version, version_json
from strom.schemas.parsed import SCHEMA_TYPES

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
FORWARDED = "X-Strom-Forwarded"
APPLIED = "X-Strom-Schemas-Offset"
_CATCH_UP_S = 5.0
DESCRIBE_CONFIGS, DESCRIBE_CONFIGS_VERSION, BROKER_RESOURCE = 32, 1, 4
LISTENERS_KEY = "schema.registry.listeners"
_FORWARD_TIMEOUT_S = 60.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=json.dumps(data).encode(), content_type=CONTENT_TYPE)


def error_response(e: RegistryError) -> web.Response:
    return _json(e.body(), e.status)


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "false").strip().lower() == "true"


def _int_path(request: web.Request, name: str) -> int:
    try:
        return int(request.match_info[name])
    except ValueError:
        raise RegistryError(err.NOT_FOUND, f"{name} must be an integer") from None


class RegistryApi:
    def __init__(self, registry: SchemaRegistry, security: Any = None, max_body: int = 4 << 20,
                 forward_ssl: Any = None) -> None:
        self.registry = registry
        self.security = security  # registry.auth.RegistrySecurity, or None: open
        self.max_body = max_body
        self._forward_ssl = forward_ssl
        self._session: ClientSession | None = None
        self._writer_urls: dict[int, str] = {}
        self.app = web.Application(client_max_size=max_body, middlewares=[self._errors])
        self._routes()

    # --- plumbing ----------------------------------------------------------------------------
    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            if self.security is not None:
                request["principal"] = await self.security.authenticate(request)
            return await handler(request)
        except RegistryError as e:
            return error_response(e)
        except web.HTTPRequestEntityTooLarge:
            return error_response(RegistryError(err.TOO_LARGE, f"The request body is over {self.max_body} bytes"))
        except web.HTTPException as e:
            if e.status == 401 and self.security is not None:
                raise
            return error_response(RegistryError(e.status, e.reason or "HTTP error"))
        except Exception:
            log.exception("schema registry: %s %s failed", request.method, request.path)
            return error_response(RegistryError(50001, "Internal error; see the broker's log"))

    async def _body(self, request: web.Request) -> Any:
        data = await request.read()
        if not data.strip():
            raise RegistryError(err.UNPROCESSABLE, "The request needs a JSON body")
        try:
            return json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise RegistryError(err.BAD_REQUEST, f"The body is not JSON: {e}") from None
        except RecursionError:
            raise RegistryError(err.BAD_REQUEST, "The body's JSON nests too deeply") from None

    def _allow(self, request: web.Request, operation: str, subject: str | None) -> None:
        if self.security is not None:
            self.security.authorize(request.get("principal"), operation, subject, request.remote or "*")

    async def _ready(self) -> None:
        await self.registry.wait_ready()

    async def _write(self, request: web.Request, op: Callable[[Any], Awaitable[Any]], with_body: bool = True) -> web.Response:
        """A write: here on the writer, else forwarded to it (once: a forwarded request that finds
        no writer here either is answered 50004)."""
        body = await self._body(request) if with_body else None
        await self._ready()
        try:
            answer = _json(await op(body))
            # how far the writer's store had read when it answered: the forwarding broker waits
            # to have read as far, so a client reads its own write at the broker it asked
            answer.headers[APPLIED] = str(self.registry.topic.next_offset)
            return answer
        except NotWriter as e:
            if request.headers.get(FORWARDED) or e.writer < 0:
                raise RegistryError(err.UNKNOWN_LEADER, "The schema registry's writer is not known "
                                    "(the leader of its topic); try again") from None
            return await self._forward(request, e.writer)

    async def _forward(self, request: web.Request, writer: int) -> web.Response:
        url = await self._writer_url(writer)
        headers = {FORWARDED: "1", "Content-Type": request.headers.get("Content-Type", CONTENT_TYPE)}
        if "Authorization" in request.headers:
            headers["Authorization"] = request.headers["Authorization"]
        if self._session is None:
            self._session = ClientSession(timeout=ClientTimeout(total=_FORWARD_TIMEOUT_S))
        try:
            async with self._session.request(request.method, url + request.rel_url.path_qs,
                                             data=await request.read(), headers=headers,
                                             ssl=self._forward_ssl if url.startswith("https") else None) as answer:
                data = await answer.read()
                applied = answer.headers.get(APPLIED, "")
                if applied.isdigit():
                    topic = self.registry.topic
                    await topic.wait(lambda: topic.next_offset >= int(applied), _CATCH_UP_S)
                return web.Response(status=answer.status, body=data,
                                    content_type=answer.content_type or CONTENT_TYPE)
        except (ClientError, TimeoutError, OSError) as e:
            self._writer_urls.pop(writer, None)
            raise RegistryError(err.FORWARDING_FAILED, f"Error while forwarding the request to the writer "
                                f"(broker {writer}, {url}): {e or type(e).__name__}") from None

    async def _writer_url(self, writer: int) -> str:
        url = self._writer_urls.get(writer)
        if url is not None:
            return url
        broker = self.registry.broker
        try:
            body = await broker.connections.call(writer, DESCRIBE_CONFIGS, DESCRIBE_CONFIGS_VERSION, {
                "resources": [{"resource_type": BROKER_RESOURCE, "resource_name": str(writer),
                               "configuration_keys": [LISTENERS_KEY]}], "include_synonyms": False}, 10.0)
        except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError, LookupError) as e:
            raise RegistryError(err.FORWARDING_FAILED, f"broker {writer} (the writer) not reached: {e}") from None
        value = next((c.value for r in body.results for c in r.configs if c.name == LISTENERS_KEY), None)
        if not value:
            raise RegistryError(err.FORWARDING_FAILED, f"broker {writer} leads the registry's topic but runs no "
                                "registry (its schema.registry.listeners is not set)")
        url = value.split(",")[0].strip().rstrip("/")
        scheme, _, rest = url.partition("://")
        host, _, port = rest.rpartition(":")
        if host in ("", "0.0.0.0", "::", "[::]"):
            host = broker.broker_endpoint(writer)[0]
        url = f"{scheme}://{host}:{port}"
        self._writer_urls[writer] = url
        return url

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    # --- routes ------------------------------------------------------------------------------
    def _routes(self) -> None:
        r = self.app.router
        r.add_get("/", self.root)
        r.add_get("/schemas/types", self.schema_types)
        r.add_get("/schemas/ids/{id}", self.schema_by_id)
        r.add_get("/schemas/ids/{id}/schema", self.schema_text_by_id)
        r.add_get("/schemas/ids/{id}/subjects", self.subjects_of_id)
        r.add_get("/schemas/ids/{id}/versions", self.versions_of_id)
        r.add_get("/subjects", self.subjects)
        r.add_post("/subjects/{subject}", self.lookup)
        r.add_delete("/subjects/{subject}", self.delete_subject)
        r.add_get("/subjects/{subject}/versions", self.versions)
        r.add_post("/subjects/{subject}/versions", self.register)
        r.add_get("/subjects/{subject}/versions/{version}", self.version)
        r.add_delete("/subjects/{subject}/versions/{version}", self.delete_version)
        r.add_get("/subjects/{subject}/versions/{version}/schema", self.version_schema)
        r.add_get("/subjects/{subject}/versions/{version}/referencedby", self.referenced_by)
        for path in ("/config", "/config/{subject}"):
            r.add_get(path, self.get_config)
            r.add_put(path, self.put_config)
            r.add_delete(path, self.delete_config)
        for path in ("/mode", "/mode/{subject}"):
            r.add_get(path, self.get_mode)
            r.add_put(path, self.put_mode)
            r.add_delete(path, self.delete_mode)
        r.add_post("/compatibility/subjects/{subject}/versions/{version}", self.compatibility)
        r.add_post("/compatibility/subjects/{subject}/versions", self.compatibility)
        r.add_get("/contexts", self.contexts)

    async def root(self, request: web.Request) -> web.Response:
        return _json({})

    async def contexts(self, request: web.Request) -> web.Response:
        return _json(["."])

    async def schema_types(self, request: web.Request) -> web.Response:
        return _json(sorted(SCHEMA_TYPES))

    def _id_readable(self, request: web.Request, schema_id: int) -> None:
        if self.security is None:
            return
        subjects = {v.subject for v in self.registry.store.versions_of_id(schema_id, deleted=True)}
        if subjects and not any(self.security.allowed(request.get("principal"), "read", s, request.remote or "*")
                                      for s in subjects):
            self._allow(request, "read", sorted(subjects)[0])

    async def schema_by_id(self, request: web.Request) -> web.Response:
        await self._ready()
        schema_id = _int_path(request, "id")
        self._id_readable(request, schema_id)
        return _json(await self.registry.schema_by_id(schema_id, request.query.get("format")))

    async def schema_text_by_id(self, request: web.Request) -> web.Response:
        await self._ready()
        schema_id = _int_path(request, "id")
        self._id_readable(request, schema_id)
        schema = self.registry.store.schema_by_id(schema_id)
        if schema is None:
            raise RegistryError(err.SCHEMA_NOT_FOUND, f"Schema {schema_id} not found")
        return web.Response(text=schema.schema, content_type=CONTENT_TYPE)

    async def subjects_of_id(self, request: web.Request) -> web.Response:
        await self._ready()
        schema_id = _int_path(request, "id")
        self._id_readable(request, schema_id)
        versions = self.registry.store.versions_of_id(schema_id, _flag(request, "deleted"))
        if self.registry.store.schema_by_id(schema_id) is None:
            raise RegistryError(err.SCHEMA_NOT_FOUND, f"Schema {schema_id} not found")
        return _json(sorted({v.subject for v in versions}))

    async def versions_of_id(self, request: web.Request) -> web.Response:
        await self._ready()
        schema_id = _int_path(request, "id")
        self._id_readable(request, schema_id)
        if self.registry.store.schema_by_id(schema_id) is None:
            raise RegistryError(err.SCHEMA_NOT_FOUND, f"Schema {schema_id} not found")
        versions = self.registry.store.versions_of_id(schema_id, _flag(request, "deleted"))
        return _json([{"subject": v.subject, "version": v.version} for v in versions])

    async def subjects(self, request: web.Request) -> web.Response:
        await self._ready()
        prefix = request.query.get("subjectPrefix", "")
        names = [s for s in self.registry.store.subject_names(_flag(request, "deleted")) if s.startswith(prefix)]
        if self.security is not None:
            names = [s for s in names if self.security.allowed(request.get("principal"), "read", s, request.remote or "*")]
        return _json(names)

    async def versions(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        self._allow(request, "read", subject)
        await self._ready()
        versions = self.registry.store.versions(subject, _flag(request, "deleted"))
        if not versions:
            raise err.subject_not_found(subject)
        return _json([v.version for v in versions])

    async def version(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        self._allow(request, "read", subject)
        await self._ready()
        v = self.registry.get_version(subject, request.match_info["version"], _flag(request, "deleted"))
        return _json(version_json(self.registry.store, v))

    async def version_schema(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        self._allow(request, "read", subject)
        await self._ready()
        v = self.registry.get_version(subject, request.match_info["version"], _flag(request, "deleted"))
        return web.Response(text=self.registry.store.schemas[v.id].schema, content_type=CONTENT_TYPE)

    async def referenced_by(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        self._allow(request, "read", subject)
        await self._ready()
        v = self.registry.get_version(subject, request.match_info["version"], True)
        return _json(self.registry.store.referenced_by(subject, v.version))

    async def lookup(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        self._allow(request, "read", subject)
        body = await self._body(request)
        await self._ready()
        return _json(await self.registry.lookup(subject, body, _flag(request, "normalize"), _flag(request, "deleted")))

    async def register(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        self._allow(request, "write", subject)
        return await self._write(request, lambda body: self.registry.register(subject, body, _flag(request, "normalize")))

    async def delete_subject(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        self._allow(request, "write", subject)
        return await self._write(request, lambda _: self.registry.delete_subject(subject, _flag(request, "permanent")),
                                 with_body=False)

    async def delete_version(self, request: web.Request) -> web.Response:
        subject, version = request.match_info["subject"], request.match_info["version"]
        self._allow(request, "write", subject)
        parse_version(version)
        return await self._write(request, lambda _: self.registry.delete_version(
            subject, version, _flag(request, "permanent")), with_body=False)

    async def compatibility(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        self._allow(request, "read", subject)
        body = await self._body(request)
        await self._ready()
        return _json(await self.registry.test_compatibility(
            subject, request.match_info.get("version"), body, _flag(request, "normalize"), _flag(request, "verbose")))

    async def get_config(self, request: web.Request) -> web.Response:
        subject = request.match_info.get("subject")
        self._allow(request, "read_config", subject)
        await self._ready()
        configs = self.registry.store.configs
        if subject is not None and subject not in configs and not _flag(request, "defaultToGlobal"):
            raise RegistryError(err.SUBJECT_COMPATIBILITY_NOT_CONFIGURED,
                                f"Subject '{subject}' does not have subject-level compatibility configured")
        return _json({"compatibilityLevel": self.registry.compatibility_of(subject).value})

    async def put_config(self, request: web.Request) -> web.Response:
        subject = request.match_info.get("subject")
        self._allow(request, "write_config", subject)
        return await self._write(request, lambda body: self.registry.set_config(subject, body))

    async def delete_config(self, request: web.Request) -> web.Response:
        subject = request.match_info.get("subject")
        self._allow(request, "write_config", subject)
        return await self._write(request, lambda _: self.registry.delete_config(subject), with_body=False)

    async def get_mode(self, request: web.Request) -> web.Response:
        subject = request.match_info.get("subject")
        self._allow(request, "read_config", subject)
        await self._ready()
        if subject is not None and subject not in self.registry.store.modes and not _flag(request, "defaultToGlobal"):
            raise RegistryError(err.SUBJECT_MODE_NOT_CONFIGURED,
                                f"Subject '{subject}' does not have subject-level mode configured")
        return _json({"mode": self.registry.mode_of(subject)})

    async def put_mode(self, request: web.Request) -> web.Response:
        subject = request.match_info.get("subject")
        self._allow(request, "write_config", subject)
        return await self._write(request, lambda body: self.registry.set_mode(subject, body, _flag(request, "force")))

    async def delete_mode(self, request: web.Request) -> web.Response:
        subject = request.match_info.get("subject")
        self._allow(request, "write_config", subject)
        return await self._write(request, lambda _: self.registry.delete_mode(subject), with_body=False)
