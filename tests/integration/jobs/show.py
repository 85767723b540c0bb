"""Prints what the rank received, as JSON: its argv, chosen env values, and facts about its files."""

import hashlib
import json
import os
import sys

token = os.environ.get("TOKEN", "")
print(json.dumps({
    "argv": sys.argv[1:],
    "env": {k: os.environ.get(k) for k in ("HOSTILE", "NEWLINE", "QUOTES", "SSH_AUTH_SOCK")},
    "token_sha": hashlib.sha256(token.encode()).hexdigest(),
}), flush=True)
if "--leak" in sys.argv:
    print(f"oops, printing the token: {token}", flush=True)
if "--fail" in sys.argv and os.environ["RANK"] == "1":
    print(f"failing with the token in the message: {token}", flush=True)
    sys.exit(2)
