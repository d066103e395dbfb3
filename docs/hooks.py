"""MkDocs hooks (mkdocs.yml `hooks:`): the reference pages are generated here."""
