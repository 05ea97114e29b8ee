package kubelet

// The CRI's methods the endpoint and its hooks know by name (full gRPC method names), in one place.
const (
	// RuntimeServicePrefix and ImageServicePrefix begin the full names of the CRI's two services'
	// methods.
	RuntimeServicePrefix = "/runtime.v1.RuntimeService/"
	ImageServicePrefix   = "/runtime.v1.ImageService/"

	// GetContainerEventsMethod is the one CRI method the endpoint answers itself.
	GetContainerEventsMethod = RuntimeServicePrefix + "GetContainerEvents"

	// The status reads.
	ListPodSandboxMethod   = RuntimeServicePrefix + "ListPodSandbox"
	ListContainersMethod   = RuntimeServicePrefix + "ListContainers"
	PodSandboxStatusMethod = RuntimeServicePrefix + "PodSandboxStatus"
	ContainerStatusMethod  = RuntimeServicePrefix + "ContainerStatus"

	// The calls about one container or sandbox, named by their request's first field.
	StartContainerMethod           = RuntimeServicePrefix + "StartContainer"
	StopContainerMethod            = RuntimeServicePrefix + "StopContainer"
	RemoveContainerMethod          = RuntimeServicePrefix + "RemoveContainer"
	UpdateContainerResourcesMethod = RuntimeServicePrefix + "UpdateContainerResources"
	StopPodSandboxMethod           = RuntimeServicePrefix + "StopPodSandbox"
)
