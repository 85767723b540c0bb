"""Every keyword OpenSSH 9.2's client knows (Debian's build: GSSAPI with its key-exchange patch, PKCS#11),
and the check ssh makes of each one's value (readconf.c process_config_line), so that clusterrun refuses
the configs ssh refuses. The values of keywords clusterrun does not use are checked and dropped; the reader
(ssh_readconf.py) keeps the ones it uses.

Pure.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Sequence

from .ssh_syntax import INT_MAX, SyntaxProblem, a2port, convtime, strtonum, valid_domain

FLAG = ("true", "false", "yes", "no")
MULTISTATE: Dict[str, Sequence[str]] = {
    "flag": FLAG, "yesnoask": FLAG + ("ask",), "strict": FLAG + ("ask", "off", "accept-new"),
    "addressfamily": ("inet", "inet6", "any"), "controlmaster": FLAG + ("auto", "ask", "autoask"),
    "tunnel": ("ethernet", "point-to-point") + FLAG, "requesttty": FLAG + ("force", "auto"),
    "sessiontype": ("none", "subsystem", "default"), "canonicalize": FLAG + ("always",),
    "pubkey": FLAG + ("unbound", "host-bound"), "compression": ("yes", "no"),
}

CIPHERS = frozenset(("3des-cbc aes128-cbc aes192-cbc aes256-cbc aes128-ctr aes192-ctr aes256-ctr "
                     "aes128-gcm@openssh.com aes256-gcm@openssh.com chacha20-poly1305@openssh.com").split())
MACS = frozenset(("hmac-sha1 hmac-sha1-96 hmac-sha2-256 hmac-sha2-512 hmac-md5 hmac-md5-96 umac-64@openssh.com "
                  "umac-128@openssh.com hmac-sha1-etm@openssh.com hmac-sha1-96-etm@openssh.com "
                  "hmac-sha2-256-etm@openssh.com hmac-sha2-512-etm@openssh.com hmac-md5-etm@openssh.com "
                  "hmac-md5-96-etm@openssh.com umac-64-etm@openssh.com umac-128-etm@openssh.com").split())
KEX = frozenset(("diffie-hellman-group1-sha1 diffie-hellman-group14-sha1 diffie-hellman-group14-sha256 "
                 "diffie-hellman-group16-sha512 diffie-hellman-group18-sha512 diffie-hellman-group-exchange-sha1 "
                 "diffie-hellman-group-exchange-sha256 ecdh-sha2-nistp256 ecdh-sha2-nistp384 ecdh-sha2-nistp521 "
                 "curve25519-sha256 curve25519-sha256@libssh.org sntrup761x25519-sha512 "
                 "sntrup761x25519-sha512@openssh.com").split())
KEY_TYPES = frozenset(("ssh-ed25519 ssh-ed25519-cert-v01@openssh.com sk-ssh-ed25519@openssh.com "
                       "sk-ssh-ed25519-cert-v01@openssh.com ecdsa-sha2-nistp256 ecdsa-sha2-nistp256-cert-v01@openssh.com "
                       "ecdsa-sha2-nistp384 ecdsa-sha2-nistp384-cert-v01@openssh.com ecdsa-sha2-nistp521 "
                       "ecdsa-sha2-nistp521-cert-v01@openssh.com sk-ecdsa-sha2-nistp256@openssh.com "
                       "sk-ecdsa-sha2-nistp256-cert-v01@openssh.com webauthn-sk-ecdsa-sha2-nistp256@openssh.com "
                       "ssh-dss ssh-dss-cert-v01@openssh.com ssh-rsa ssh-rsa-cert-v01@openssh.com rsa-sha2-256 "
                       "rsa-sha2-256-cert-v01@openssh.com rsa-sha2-512 rsa-sha2-512-cert-v01@openssh.com").split())
LOG_LEVELS = ("quiet", "fatal", "error", "info", "verbose", "debug", "debug1", "debug2", "debug3")
FACILITIES = ("daemon", "user", "auth", "authpriv") + tuple(f"local{i}" for i in range(8))
IPQOS = ("af11 af12 af13 af21 af22 af23 af31 af32 af33 af41 af42 af43 cs0 cs1 cs2 cs3 cs4 cs5 cs6 cs7 ef le "
         "lowdelay throughput reliability").split()
DIGESTS = ("md5", "sha1", "sha256", "sha384", "sha512")

# keyword -> how its value is read; the reader handles the ones it keeps itself (READER)
KEYWORDS: Dict[str, str] = {
    "protocol": "ignore", "cipher": "deprecated", "fallbacktorsh": "deprecated",
    "globalknownhostsfile2": "deprecated", "rhostsauthentication": "deprecated",
    "userknownhostsfile2": "deprecated", "useroaming": "deprecated", "usersh": "deprecated",
    "useprivilegedport": "deprecated", "afstokenpassing": "unsupported", "kerberosauthentication": "unsupported",
    "kerberostgtpassing": "unsupported", "rsaauthentication": "unsupported", "rhostsrsaauthentication": "unsupported",
    "compressionlevel": "unsupported",
    "gssapiauthentication": "flag", "gssapidelegatecredentials": "flag", "gssapikeyexchange": "flag",
    "gssapitrustdns": "flag", "gssapirenewalforcesrekey": "flag", "gssapiclientidentity": "string",
    "gssapiserveridentity": "string", "gssapikexalgorithms": "string",
    "pkcs11provider": "string", "smartcarddevice": "string",
    "forwardagent": "forwardagent", "forwardx11": "flag", "forwardx11trusted": "flag", "forwardx11timeout": "time",
    "exitonforwardfailure": "flag", "xauthlocation": "string", "gatewayports": "flag",
    "passwordauthentication": "flag", "kbdinteractiveauthentication": "flag", "kbdinteractivedevices": "string",
    "challengeresponseauthentication": "flag", "skeyauthentication": "flag", "tisauthentication": "flag",
    "pubkeyauthentication": "pubkey", "dsaauthentication": "pubkey", "hostbasedauthentication": "flag",
    "identityfile": "reader", "identityfile2": "reader", "identitiesonly": "reader", "certificatefile": "string",
    "addkeystoagent": "addkeystoagent", "identityagent": "agentpath", "hostname": "reader", "hostkeyalias": "reader",
    "proxycommand": "reader", "port": "reader", "ciphers": "ciphers", "macs": "macs", "remoteforward": "forward",
    "localforward": "forward", "permitremoteopen": "permitremoteopen", "user": "reader", "host": "reader",
    "match": "reader", "escapechar": "escapechar", "globalknownhostsfile": "array",
    "userknownhostsfile": "reader", "connectionattempts": "int", "batchmode": "flag", "checkhostip": "flag",
    "stricthostkeychecking": "strict", "compression": "compression", "tcpkeepalive": "flag", "keepalive": "flag",
    "numberofpasswordprompts": "int", "syslogfacility": "facility", "loglevel": "loglevel",
    "logverbose": "array", "dynamicforward": "dynamicforward", "preferredauthentications": "string",
    "hostkeyalgorithms": "keytypes", "casignaturealgorithms": "keytypes", "bindaddress": "string",
    "bindinterface": "string", "clearallforwardings": "flag", "enablesshkeysign": "flag",
    "verifyhostkeydns": "yesnoask", "nohostauthenticationforlocalhost": "flag", "rekeylimit": "rekeylimit",
    "connecttimeout": "time", "addressfamily": "reader", "serveraliveinterval": "time",
    "serveralivecountmax": "int", "sendenv": "sendenv", "setenv": "setenv", "controlpath": "string",
    "controlmaster": "controlmaster", "controlpersist": "controlpersist", "hashknownhosts": "flag",
    "include": "reader", "tunnel": "tunnel", "tunneldevice": "tunneldevice", "localcommand": "command",
    "permitlocalcommand": "flag", "remotecommand": "command", "visualhostkey": "flag", "kexalgorithms": "kex",
    "ipqos": "ipqos", "requesttty": "requesttty", "sessiontype": "sessiontype", "stdinnull": "flag",
    "forkafterauthentication": "flag", "proxyusefdpass": "flag", "canonicaldomains": "reader",
    "canonicalizefallbacklocal": "reader", "canonicalizehostname": "reader", "canonicalizemaxdots": "reader",
    "canonicalizepermittedcnames": "reader", "streamlocalbindmask": "bindmask", "streamlocalbindunlink": "flag",
    "revokedhostkeys": "string", "fingerprinthash": "fingerprinthash", "updatehostkeys": "yesnoask",
    "hostbasedacceptedalgorithms": "keytypes", "hostbasedkeytypes": "keytypes",
    "pubkeyacceptedalgorithms": "keytypes", "pubkeyacceptedkeytypes": "keytypes", "ignoreunknown": "reader",
    "proxyjump": "reader", "securitykeyprovider": "string", "knownhostscommand": "command",
    "requiredrsasize": "int", "enableescapecommandline": "flag",
}

Check = Callable[[List[str], str], int]  # (words, the line after the keyword) -> how many words it used


def first(words: List[str], what: str = "missing argument") -> str:
    if not words or words[0] == "":
        raise SyntaxProblem(what)
    return words[0]


def multistate(table: Sequence[str]) -> Check:
    def check(words: List[str], raw: str) -> int:
        if first(words).lower() not in table:
            raise SyntaxProblem(f'unsupported option "{words[0]}" (one of {", ".join(table)})')
        return 1
    return check


def integer(words: List[str], raw: str) -> int:
    if not words or words[0] == "":
        raise SyntaxProblem("integer value missing")
    if strtonum(words[0], 0, INT_MAX) is None:
        raise SyntaxProblem(f"integer value invalid: {words[0]!r}")
    return 1


def time_value(words: List[str], raw: str) -> int:
    value = first(words, "missing time value")
    if value != "none" and convtime(value) < 0:
        raise SyntaxProblem(f"invalid time value {value!r}")
    return 1


def string(words: List[str], raw: str) -> int:
    first(words)
    return 1


def command(words: List[str], raw: str) -> int:
    return len(words)


def consume(words: List[str], raw: str) -> int:
    return len(words)


def array(words: List[str], raw: str) -> int:
    """GlobalKnownHostsFile, UserKnownHostsFile, LogVerbose: words, `none` only alone."""
    for word in words:
        if word == "":
            raise SyntaxProblem("empty argument")
        if word.lower() == "none" and len(words) > 1:
            raise SyntaxProblem('"none" argument must appear alone')
    return len(words)


def algorithms(names: frozenset, wildcards: bool = False) -> Check:
    def check(words: List[str], raw: str) -> int:
        spec = first(words)
        if spec.startswith("-"):
            return 1
        body = spec[1:] if spec[:1] in "+^" else spec
        for name in body.split(","):
            if not name:
                break
            if name in names or (wildcards and any(c in name for c in "*?")):
                continue
            raise SyntaxProblem(f"bad algorithm name {name!r} in {spec!r}")
        return 1
    return check


def loglevel(words: List[str], raw: str) -> int:
    if not words or words[0].lower() not in LOG_LEVELS:
        raise SyntaxProblem(f"unsupported log level {words[0] if words else '<NONE>'!r}")
    return 1


def facility(words: List[str], raw: str) -> int:
    if not words or words[0].lower() not in FACILITIES:
        raise SyntaxProblem(f"unsupported log facility {words[0] if words else '<NONE>'!r}")
    return 1


def forward(words: List[str], raw: str) -> int:
    first(words)
    if len(words) < 2 or words[1] == "":
        raise SyntaxProblem("missing target argument")
    return 2


def remote_forward(words: List[str], raw: str) -> int:
    first(words)
    return 2 if len(words) > 1 and words[1] else 1


def dynamic_forward(words: List[str], raw: str) -> int:
    first(words)
    return 1


def permit_remote_open(words: List[str], raw: str) -> int:
    if not words:
        raise SyntaxProblem("missing PermitRemoteOpen specification")
    for word in words:
        if word.lower() in ("none", "any"):
            if len(words) > 1:
                raise SyntaxProblem(f'"{word}" argument must appear alone')
            continue
        host, _, port = word.rpartition(":")
        if not host or (port != "*" and a2port(port) <= 0):
            raise SyntaxProblem(f"bad host:port {word!r}")
    return len(words)


def escape_char(words: List[str], raw: str) -> int:
    arg = first(words)
    if arg == "none" or len(arg) == 1 or (len(arg) == 2 and arg[0] == "^" and 64 <= ord(arg[1]) < 128):
        return 1
    raise SyntaxProblem("bad escape character")


def _ipqos(word: str) -> bool:
    if word.lower() in IPQOS:
        return True
    try:
        return 0 <= int(word, 0) <= 255
    except ValueError:
        return False


def ipqos(words: List[str], raw: str) -> int:
    if not words or not _ipqos(words[0]):
        raise SyntaxProblem(f"bad IPQoS value: {words[0] if words else '(null)'}")
    if len(words) > 1 and not _ipqos(words[1]):
        raise SyntaxProblem(f"bad IPQoS value: {words[1]}")
    return min(len(words), 2)


def tunnel_device(words: List[str], raw: str) -> int:
    arg = first(words)
    for part in arg.split(":", 1):
        if part != "any" and strtonum(part, 0, 0x7fffffff - 2) is None:
            raise SyntaxProblem("bad tun device")
    return 1


def bind_mask(words: List[str], raw: str) -> int:
    arg = first(words, "missing StreamLocalBindMask argument")
    try:
        if not 0 <= int(arg, 8) <= 0o777:
            raise ValueError
    except ValueError:
        raise SyntaxProblem("bad mask") from None
    return 1


def _scaled(word: str) -> bool:
    body = word[:-1] if word[-1:].upper() in ("K", "M", "G", "T", "P", "E", "B") else word
    try:
        float(body)
        return True
    except ValueError:
        return False


def rekey_limit(words: List[str], raw: str) -> int:
    arg = first(words)
    if arg != "default" and not _scaled(arg):
        raise SyntaxProblem(f"bad number {arg!r}")
    if len(words) > 1 and words[1] != "none":
        time_value(words[1:], raw)
    return min(len(words), 2)


def fingerprint_hash(words: List[str], raw: str) -> int:
    if first(words).lower() not in DIGESTS:
        raise SyntaxProblem(f'invalid hash algorithm "{words[0]}"')
    return 1


def add_keys(words: List[str], raw: str) -> int:
    arg = words[0] if words else ""
    table = MULTISTATE["yesnoask"] + ("confirm",)
    if arg.lower() == "confirm" and len(words) > 1:
        if convtime(words[1]) < 0:
            raise SyntaxProblem("invalid time value")
        return 2
    if arg.lower() in table and len(words) == 1:
        return 1
    if arg.lower() not in table and len(words) == 1 and convtime(arg) >= 0:
        return 1
    raise SyntaxProblem("unsupported option")


def agent_path(words: List[str], raw: str) -> int:
    arg = first(words)
    if arg.startswith("$") and not arg.startswith("${") and not (arg[1:] and all(c.isalnum() or c == "_"
                                                                                   for c in arg[1:])):
        raise SyntaxProblem(f"invalid environment name {arg}")
    if "${" in arg and "}" not in arg[arg.index("${"):]:
        raise SyntaxProblem(f"invalid environment expansion {arg}")
    return 1


def forward_agent(words: List[str], raw: str) -> int:
    first(words)
    return 1 if words[0].lower() in FLAG else agent_path(words, raw)


def send_env(words: List[str], raw: str) -> int:
    if any(w == "" or "=" in w for w in words):
        raise SyntaxProblem("invalid environment name")
    return len(words)


def set_env(words: List[str], raw: str) -> int:
    if any("=" not in w for w in words):
        raise SyntaxProblem("invalid SetEnv")
    return len(words)


def control_persist(words: List[str], raw: str) -> int:
    arg = first(words, "missing ControlPersist argument")
    if arg not in ("no", "false", "yes", "true") and convtime(arg) < 0:
        raise SyntaxProblem("bad ControlPersist argument")
    return 1


def canonical_domains(words: List[str], raw: str) -> int:
    for word in words:
        if word == "":
            raise SyntaxProblem("empty argument")
        if word.lower() == "none" and len(words) > 1:
            raise SyntaxProblem('"none" argument must appear alone')
        why = valid_domain(word)
        if why:
            raise SyntaxProblem(why)
    return len(words)


def permitted_cnames(words: List[str], raw: str) -> int:
    for word in words:
        if word.lower() == "none":
            if len(words) > 1:
                raise SyntaxProblem('"none" argument must appear alone')
        elif word != "*" and not word.partition(":")[2]:
            raise SyntaxProblem(f'invalid permitted CNAME "{word}"')
    return len(words)


CHECKS: Dict[str, Check] = {
    "ignore": consume, "deprecated": consume, "unsupported": consume, "int": integer, "time": time_value,
    "string": string, "command": command, "array": array, "ciphers": algorithms(CIPHERS), "macs": algorithms(MACS),
    "kex": algorithms(KEX), "keytypes": algorithms(KEY_TYPES, wildcards=True), "loglevel": loglevel,
    "facility": facility, "forward": forward, "dynamicforward": dynamic_forward,
    "permitremoteopen": permit_remote_open, "escapechar": escape_char, "ipqos": ipqos,
    "tunneldevice": tunnel_device, "bindmask": bind_mask, "rekeylimit": rekey_limit,
    "fingerprinthash": fingerprint_hash, "addkeystoagent": add_keys, "agentpath": agent_path,
    "forwardagent": forward_agent, "sendenv": send_env, "setenv": set_env, "controlpersist": control_persist,
    "canonicaldomains": canonical_domains, "canonicalizepermittedcnames": permitted_cnames,
    **{name: multistate(table) for name, table in MULTISTATE.items()},
}


def check_value(keyword: str, words: List[str], raw: str) -> int:
    """How many of words the keyword's value takes; SyntaxProblem where ssh refuses the value."""
    kind = KEYWORDS[keyword]
    if keyword == "remoteforward":
        return remote_forward(words, raw)
    return CHECKS[kind](words, raw)
