"""Token datasets in object storage (``s3://bucket/prefix``), through boto3 (the ``s3`` extra).

``uri`` parses and prints the URLs; ``client`` makes the one S3 client of a
process and turns its failures into one-line errors; ``upload`` writes a
finished local dataset into a bucket (``dlm data build --out s3://...``);
``node_cache`` keeps a verified local copy per node for the readers, each
file fetched by ``download`` (resumable, hashed as it arrives).
boto3 is imported only inside the functions that talk to the store.
"""
