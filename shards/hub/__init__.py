"""Stage shards on the Hugging Face Hub or an office mirror of it.

``shards.hub.publish`` puts an export on the Hub (``publish_to_hub``) or into the git repositories that a
mirror server such as olah serves (``publish_to_mirror``); ``shards.hub.fetch`` downloads only the files an
agent needs, pinned to a commit, and checks each of them against the manifest before handing them out.
"""
