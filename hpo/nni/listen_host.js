// Loaded into NNI's manager (node) with NODE_OPTIONS=--require by hpo.nni.manager: NNI 3.0 has no option for
// the address its REST server and web UI listen on (it calls `app.listen(port)`, every interface). A server
// asked to listen on a bare port listens on HPO_NNI_HOST instead; one given an address keeps it.
'use strict';
const net = require('net');
const host = process.env.HPO_NNI_HOST;
if (host) {
    const listen = net.Server.prototype.listen;
    net.Server.prototype.listen = function (...args) {
        const port = args[0];
        const barePort = typeof port === 'number' || (typeof port === 'string' && /^\d+$/.test(port));
        if (barePort && typeof args[1] !== 'string') {
            args.splice(1, 0, host);
        }
        return listen.apply(this, args);
    };
}
