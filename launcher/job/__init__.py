"""The job a node is part of: SageMaker's environment (sm_env), which role this node plays and
where the others are (roles), the job token and secret (jobtoken, jobsecret), the start-up checks
of the job's plug-ins (preflight) and what a node leaves in its output folder (output_files)."""
