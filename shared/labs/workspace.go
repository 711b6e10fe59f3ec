package labs

// Names a Pod lab's workspace Pod is known by beyond its definition
// (infra/guardian/workspace-pod.yaml): the Kubernetes adapter builds the
// Pod and its NetworkPolicy with them, and the web terminal execs into the
// container and calls guardian by them, so both read them here.
const (
	// WorkspaceContainer is the name of the student's container in a
	// workspace Pod; guardian finds its cgroup by this name.
	WorkspaceContainer = "workspace"
	// GuardianAPIPort is the name of guardian's API port in the workspace
	// Pod; a session's NetworkPolicy opens it to the platform's namespace
	// only, by this name.
	GuardianAPIPort = "guardian-api"
)
