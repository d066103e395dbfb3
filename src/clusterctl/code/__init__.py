"""The code side: what of a user's project directory (the workdir) ships to the cluster,
as a deterministic, content-addressed snapshot.  Pure and local: nothing here reaches a
node (run/ ships the snapshot; the nodes keep a copy per digest).

One job per module:

* ``ignore``: which files ship; what git lists (else .gitignore and .git/info/exclude),
  .clusterctlignore at every level, built-in exclusions (``.git``, virtual environments,
  caches, keys); refuses links out of the tree, FIFOs and devices, unreadable files and
  names that are not UTF-8 text with every problem at once (``WorkdirError``, a ``UserError``: exit status 2);
* ``snapshot``: the shipped entries hashed (sha256) into a ``Snapshot`` whose digest is
  that of its manifest, a size limit, the manifest's format and parser, a deterministic
  tar of some or all entries, and ``parse_size``;
* ``gitinfo``: the commit and dirtiness of a workdir, for run records (unknowns, never
  errors), and what git lists in it, nested repositories' own listings included
  (``Unlisted`` inside a repository git cannot list: ``ignore`` refuses it).

Data flows ignore.walk -> snapshot.take -> Snapshot (manifest, digest) -> write_tar.
code/ imports core/ only (cluster/ is allowed); run/ and cli/ import code/.
"""
