"""Images where clusters pull from: a registry, by digest.

- ``reference``: registry addresses and image references in them (pure);
- ``push``: this machine's engine pushes an image to a registry and reads its digest;
- ``pull``: nodes pull an image by digest, with this machine's credentials for that
  registry sent for the one pull and removed after it.

Credentials come from the usual Docker config (``docker login``), never from the
command line, an inventory or a record.
"""
