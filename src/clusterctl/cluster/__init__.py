"""The nodes side: inventory, SSH transport, preflight, image distribution, sandbox, engines."""
