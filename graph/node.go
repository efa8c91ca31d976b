package graph

// Node is what node(id:) returns: an object with a global id. Only instances are nodes today;
// the schema's Node interface is bound to this type so that the domain's types need no method
// of the API's.
type Node interface{}
