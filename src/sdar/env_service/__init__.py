"""The environment service one pipeline run shares: started by the launch_envs component (a local
server process, or a Deployment + Service built from charts/sdar-envs) and stopped by teardown_envs.

Modules: `manifests` (the Deployment and Service from the chart's values), `cluster` (the
Kubernetes calls), `local` (the detached server process and its pid registry).
"""
