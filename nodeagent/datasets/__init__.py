"""Staging a job's datasets into this node's cache before its ranks start (issue #33).

fetch.py copies a directory or downloads and unpacks an archive into a temporary
directory (verifying the digest on the way), s3.py does it for s3:// sources
(the optional extra corral[s3]); cache.py keeps the node-local,
content-addressed cache (renamed into place only complete and verified, LRU
eviction of entries no job uses, reconciled on start); stager.py ties both to
the agent: it stages what the log's gangs here need and tells the log.
"""
