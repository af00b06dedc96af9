"""Serving data: a data server of the job's pipeline started with the launcher's options (server),
and the data node that runs one until the DNN nodes shut it down (data_node)."""
