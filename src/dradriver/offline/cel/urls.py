"""The Kubernetes URL CEL library (k8s.io/apiserver pkg/cel/library/urls.go, pkg/cel/url.go).

`url()` and `isURL()` accept what Go's `net/url.ParseRequestURI` accepts, and the getters read
the `url.URL` that `net/url.Parse` builds; both are ported here with their error messages,
because the library reports them verbatim. Python's `urllib.parse` splits and escapes
differently (it accepts almost anything and never fails on bad escapes), so it is not used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dradriver.offline.cel.errors import EvalError
from dradriver.offline.cel.network import parse_ip_literal
from dradriver.offline.cel.values import OpaqueValue, expect, go_quote

# net/url's encoding modes.
_PATH, _USER, _QUERY, _FRAGMENT, _HOST, _ZONE = range(6)
_UPPER_HEX = "0123456789ABCDEF"


class URLError(ValueError):
    """A net/url parse error, worded as Go's error string."""


def _should_escape(c: int, mode: int) -> bool:
    ch = chr(c)
    if ch.isascii() and ch.isalnum():
        return False
    if mode in (_HOST, _ZONE) and ch in "!$&'()*+,;=:[]<>\"":
        return False
    if ch in "-_.~":
        return False
    if ch in "$&+,/:;=?@":
        if mode == _PATH:
            return ch == "?"
        if mode == _USER:
            return ch in "@/?:"
        if mode == _QUERY:
            return True
        if mode == _FRAGMENT:
            return False
    return not (mode == _FRAGMENT and ch in "!()*")


def _escape(text: str, mode: int) -> str:
    out: list[str] = []
    for c in text.encode():
        if c == 0x20 and mode == _QUERY:
            out.append("+")
        elif _should_escape(c, mode):
            out.append("%" + _UPPER_HEX[c >> 4] + _UPPER_HEX[c & 15])
        else:
            out.append(chr(c))
    return "".join(out)


def _is_hex(ch: str) -> bool:
    return ch in "0123456789abcdefABCDEF"


def _unescape(text: str, mode: int) -> str:
    raw = text.encode()
    i = 0
    while i < len(raw):
        c = raw[i]
        if c == 0x25:  # '%'
            if i + 2 >= len(raw) or not _is_hex(chr(raw[i + 1])) or not _is_hex(chr(raw[i + 2])):
                bad = raw[i : i + 3].decode(errors="replace")
                raise URLError(f"invalid URL escape {go_quote(bad)}")
            value = int(raw[i + 1 : i + 3], 16)
            if mode == _HOST and value < 0x80 and raw[i : i + 3] != b"%25":
                raise URLError(f"invalid URL escape {go_quote(raw[i : i + 3].decode())}")
            if mode == _ZONE and raw[i : i + 3] != b"%25" and value != 0x20 and _should_escape(value, _HOST):
                raise URLError(f"invalid URL escape {go_quote(raw[i : i + 3].decode())}")
            i += 3
        else:
            if mode in (_HOST, _ZONE) and c < 0x80 and _should_escape(c, mode):
                raise URLError(f"invalid character {go_quote(chr(c))} in host name")
            i += 1
    out = bytearray()
    i = 0
    while i < len(raw):
        c = raw[i]
        if c == 0x25:
            out.append(int(raw[i + 1 : i + 3], 16))
            i += 3
        elif c == 0x2B and mode == _QUERY:  # '+'
            out.append(0x20)
            i += 1
        else:
            out.append(c)
            i += 1
    return out.decode(errors="surrogateescape")


def _valid_optional_port(port: str) -> bool:
    return port == "" or (port[0] == ":" and all("0" <= ch <= "9" for ch in port[1:]))


def _valid_userinfo(text: str) -> bool:
    return all((ch.isascii() and ch.isalnum()) or ch in "-._:~!$&'()*+,;=%@" for ch in text)


@dataclass(frozen=True, slots=True)
class URL(OpaqueValue):
    """A parsed net/url URL; equal to another when their String() forms are equal."""

    cel_type_name = "kubernetes.URL"

    scheme: str = ""
    opaque: str = ""
    user: tuple[str, str | None] | None = None
    host: str = ""
    path: str = ""
    raw_path: str = ""
    omit_host: bool = False
    force_query: bool = False
    raw_query: str = ""
    fragment: str = ""
    raw_fragment: str = ""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, URL) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def escaped_path(self) -> str:
        return _escaped(self.raw_path, self.path, _PATH, "*")

    def hostname(self) -> str:
        return _split_host_port(self.host)[0]

    def port(self) -> str:
        return _split_host_port(self.host)[1]

    def query(self) -> dict[str, tuple[str, ...]]:
        """url.ParseQuery, keeping what parses (semicolons and bad escapes drop a pair)."""
        values: dict[str, list[str]] = {}
        for pair in self.raw_query.split("&"):
            if not pair or ";" in pair:
                continue
            key, _, value = pair.partition("=")
            try:
                key, value = _unescape(key, _QUERY), _unescape(value, _QUERY)
            except URLError:
                continue
            values.setdefault(key, []).append(value)
        return {key: tuple(items) for key, items in values.items()}

    def __str__(self) -> str:
        out: list[str] = []
        if self.scheme:
            out += [self.scheme, ":"]
        if self.opaque:
            out.append(self.opaque)
        else:
            if (self.scheme or self.host or self.user is not None) and not (
                self.omit_host and not self.host and self.user is None
            ):
                if self.host or self.path or self.user is not None:
                    out.append("//")
                if self.user is not None:
                    name, password = self.user
                    out.append(_escape(name, _USER))
                    if password is not None:
                        out += [":", _escape(password, _USER)]
                    out.append("@")
                if self.host:
                    out.append(_escape(self.host, _HOST))
            path = self.escaped_path()
            if path and path[0] != "/" and self.host:
                out.append("/")
            if not out and ":" in path.partition("/")[0]:
                out.append("./")
            out.append(path)
        if self.force_query or self.raw_query:
            out += ["?", self.raw_query]
        if self.fragment:
            out += ["#", _escaped(self.raw_fragment, self.fragment, _FRAGMENT, None)]
        return "".join(out)


def _valid_encoded(text: str, mode: int) -> bool:
    return all(chr(c) in "!$&'()*+,;=:@[]%" or not _should_escape(c, mode) for c in text.encode())


def _escaped(raw: str, decoded: str, mode: int, verbatim: str | None) -> str:
    """EscapedPath / EscapedFragment: the raw form when it is a valid encoding of the value."""
    if raw and _valid_encoded(raw, mode):
        try:
            if _unescape(raw, mode) == decoded:
                return raw
        except URLError:
            pass
    if decoded == verbatim:
        return decoded
    return _escape(decoded, mode)


def _split_host_port(host_port: str) -> tuple[str, str]:
    host, port = host_port, ""
    colon = host.rfind(":")
    if colon != -1 and _valid_optional_port(host[colon:]):
        host, port = host[:colon], host[colon + 1 :]
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def _get_scheme(raw: str) -> tuple[str, str]:
    for i, ch in enumerate(raw):
        if ch.isascii() and ch.isalpha():
            continue
        if ch.isascii() and (ch.isdigit() or ch in "+-."):
            if i == 0:
                return "", raw
            continue
        if ch == ":":
            if i == 0:
                raise URLError("missing protocol scheme")
            return raw[:i], raw[i + 1 :]
        return "", raw
    return "", raw


def _parse_host(host: str) -> str:
    if host.startswith("["):
        end = host.rfind("]")
        if end < 0:
            raise URLError("missing ']' in host")
        colon_port = host[end + 1 :]
        if not _valid_optional_port(colon_port):
            raise URLError(f"invalid port {go_quote(colon_port)} after host")
        zone = host.find("%25", 0, end)
        if zone >= 0:
            unescaped = _unescape(host[1:zone], _HOST) + _unescape(host[zone:end], _ZONE)
        else:
            unescaped = _unescape(host[1:end], _HOST)
        try:
            parse_ip_literal(unescaped)
        except ValueError as err:
            raise URLError(str(err)) from None
        return "[" + unescaped + "]" + _unescape(colon_port, _HOST)
    colon = host.rfind(":")
    if colon != -1:
        if host.find(":") != colon:
            raise URLError(f"invalid port {go_quote(host[host.find(':') :])} after host")
        if not _valid_optional_port(host[colon:]):
            raise URLError(f"invalid port {go_quote(host[colon:])} after host")
    return _unescape(host, _HOST)


def _parse_authority(authority: str) -> tuple[tuple[str, str | None] | None, str]:
    at = authority.rfind("@")
    host = _parse_host(authority[at + 1 :] if at >= 0 else authority)
    if at < 0:
        return None, host
    userinfo = authority[:at]
    if not _valid_userinfo(userinfo):
        raise URLError("net/url: invalid userinfo")
    if ":" not in userinfo:
        return (_unescape(userinfo, _USER), None), host
    name, _, password = userinfo.partition(":")
    return (_unescape(name, _USER), _unescape(password, _USER)), host


def _parse(raw: str, via_request: bool) -> URL:
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in raw):
        raise URLError("net/url: invalid control character in URL")
    if not raw and via_request:
        raise URLError("empty url")
    if raw == "*":
        return URL(path="*")
    scheme, rest = _get_scheme(raw)
    scheme = scheme.lower()
    force_query, raw_query = False, ""
    if rest.endswith("?") and rest.count("?") == 1:
        force_query, rest = True, rest[:-1]
    else:
        rest, _, raw_query = rest.partition("?")
    if not rest.startswith("/"):
        if scheme:
            return URL(scheme=scheme, opaque=rest, force_query=force_query, raw_query=raw_query)
        if via_request:
            raise URLError("invalid URI for request")
        if ":" in rest.partition("/")[0]:
            raise URLError("first path segment in URL cannot contain colon")
    user: tuple[str, str | None] | None = None
    host = ""
    omit_host = False
    if (scheme or (not via_request and not rest.startswith("///"))) and rest.startswith("//"):
        authority, slash, path = rest[2:].partition("/")
        rest = slash + path
        user, host = _parse_authority(authority)
    elif scheme and rest.startswith("/"):
        omit_host = True
    path = _unescape(rest, _PATH)
    raw_path = "" if _escape(path, _PATH) == rest else rest
    return URL(scheme, "", user, host, path, raw_path, omit_host, force_query, raw_query)


def _error(raw: str, err: URLError) -> EvalError:
    return EvalError(f"URL parse error during conversion from string: parse {go_quote(raw)}: {err}")


def parse_url(raw: str) -> URL:
    """stringToUrl: url.ParseRequestURI must accept it, then url.Parse builds the value."""
    try:
        _parse(raw, via_request=True)
    except URLError as err:
        raise _error(raw, err) from None
    text, hash_sign, fragment = raw.partition("#")
    try:
        parsed = _parse(text, via_request=False)
    except URLError as err:
        raise _error(text, err) from None
    if not hash_sign:
        return parsed
    try:
        decoded = _unescape(fragment, _FRAGMENT)
    except URLError as err:
        raise _error(raw, err) from None
    raw_fragment = "" if _escape(decoded, _FRAGMENT) == fragment else fragment
    return URL(
        parsed.scheme,
        parsed.opaque,
        parsed.user,
        parsed.host,
        parsed.path,
        parsed.raw_path,
        parsed.omit_host,
        parsed.force_query,
        parsed.raw_query,
        decoded,
        raw_fragment,
    )


# -- the library functions ----------------------------------------------------------------------


def url(value: Any) -> URL:
    return parse_url(expect(value, str))


def is_url(value: Any) -> bool:
    try:
        _parse(expect(value, str), via_request=True)
    except URLError:
        return False
    return True


def request_uri_error(raw: str) -> str | None:
    """The error string of Go's url.ParseRequestURI(raw), or None when it parses."""
    try:
        _parse(raw, via_request=True)
    except URLError as err:
        return f"parse {go_quote(raw)}: {err}"
    return None


def get_scheme(value: Any) -> str:
    return expect(value, URL).scheme


def get_host(value: Any) -> str:
    return expect(value, URL).host


def get_hostname(value: Any) -> str:
    return expect(value, URL).hostname()


def get_port(value: Any) -> str:
    return expect(value, URL).port()


def get_escaped_path(value: Any) -> str:
    return expect(value, URL).escaped_path()


def get_query(value: Any) -> dict[str, tuple[str, ...]]:
    return expect(value, URL).query()
