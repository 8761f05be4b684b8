"""`seedq certs`: a CA, learner and actor certificates and a token for a cluster."""

from __future__ import annotations

import argparse
import sys

from seedq.cli.common import HelpFormatter, csv_of


def add_parsers(sub) -> None:
    certs = sub.add_parser(
        "certs",
        help="make a CA plus learner (server) and actor (client) certificates and a token for a cluster",
        description="Writes OUT/ca.pem, ca-key.pem, server.pem, server-key.pem, client.pem, "
        "client-key.pem and token (keys and token mode 0600). The learner takes --tls.cert "
        "server.pem --tls.key server-key.pem [--tls.client-ca ca.pem] --auth.token-file token; "
        "actors take --tls.ca ca.pem [--tls.cert client.pem --tls.key client-key.pem] "
        "--auth.token-file token. See docs/security.md.",
        formatter_class=HelpFormatter,
    )
    certs.add_argument("--out", required=True, help="output directory")
    certs.add_argument("--hosts", type=csv_of(str), default=",".join(("localhost", "127.0.0.1", "::1")),
                       help="names and IP addresses actors dial the learner by (the server "
                       "certificate's subject alternative names)")
    certs.add_argument("--days", type=int, default=365, help="validity of the certificates")
    certs.add_argument("--replace", action="store_true",
                       help="replace the credentials already in --out, the CA key included (every "
                       "certificate the old CA signed stops being trusted); without it they are refused")


def run(args: argparse.Namespace) -> int:
    from seedq.transport import certs as certs_lib
    from seedq.process import exit_codes

    try:
        paths = certs_lib.make(args.out, args.hosts, args.days, replace=args.replace)
    except exit_codes.UsageError as e:
        print(f"seedq certs: {e}", file=sys.stderr)
        return exit_codes.USAGE
    except (ValueError, OSError) as e:
        print(f"seedq certs: {e}", file=sys.stderr)
        return exit_codes.RUNTIME_FAILURE
    print(f"wrote {', '.join(sorted(paths))} to {args.out}")
    return 0
