"""code/: what of a workdir ships (ignore rules, refusals), its snapshot, manifest and tar,
and its git state; on real files in tmp_path and a real git."""
