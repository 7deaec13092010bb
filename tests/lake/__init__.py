"""The data-lake source: keys, events, the follower, real processes, an s3:// lake."""
